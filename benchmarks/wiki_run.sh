#!/usr/bin/env bash
# The real run reported in the closing notes: the whole pipeline, from ingest to the 7-task STS
# table, on the Wikipedia sentences of ../shared/data/corpus (SimCSE's wiki1m, first 11,914
# lines), then every objective trained from MiniLM-L6 on the same mined pairs with the same
# steps, batch and seed.
#
#     bash benchmarks/wiki_run.sh [OUT=runs/wiki]        # STEPS=100 BATCH=32 to change the run
#
# The params are the apertium profile's (the demo's with Apertium's round trips en-es-en,
# en-ca-en, en-eo-en) with the corpus, shard sizes, steps and the full STS test sets swapped in
# (written to OUT/params.yaml); every stage resumes, so a rerun after a kill continues where it
# stopped. Apertium needs Debian's packages:
#     apt-get install apertium apertium-eng-spa apertium-eng-cat apertium-eo-en
# POSITIVES=standin takes the demo's stand-in Marian models instead (no Opus-MT can be downloaded
# here; they copy the sentence with seeded word substitutions). With Apertium, the stand-ins also
# translate the corpus (data/candidates-standin) so that the report measures both side by side.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$(mkdir -p "${1:-runs/wiki}" && cd "${1:-runs/wiki}" && pwd)"
SHARED="${PAIRFORGE_SHARED_DATA:-$(cd "$ROOT/.." && pwd)/shared/data}"
export PAIRFORGE_SHARED_DATA="$SHARED" DVC_NO_ANALYTICS=1 HF_HUB_OFFLINE=1
STEPS="${STEPS:-100}" BATCH="${BATCH:-32}" POSITIVES="${POSITIVES:-apertium}"
OBJECTIVES="${OBJECTIVES:-simcse debcse denosent bsl infocse cotbert}"
# STAGES="" trains and evaluates on the pairs already mined (a stage whose code changed reruns).
STAGES="${STAGES-ingest standin backtranslate rewrite embed mine sample report pretrain}"

python - "$POSITIVES" "$OUT/params.yaml" "$SHARED" "$STEPS" "$BATCH" <<'PY'
import copy, sys, yaml
from pairforge.stages.profile import profile_params
positives, out, shared, steps, batch = sys.argv[1:]
p = profile_params("apertium" if positives == "apertium" else "demo")
p["ingest"].update(root=f"{shared}/corpus", inputs=["wiki1m_for_simcse.first1280000bytes.txt"],
                   rows_per_shard=2000, chunk_rows=1000)
p["sample"].update(corpus_name="SimCSE wiki1m (first 11,914 lines)", corpus_license="CC-BY-SA-3.0")
p["pretrain"].update(steps=100, batch_size=32)
# The STS data is required here: no fallback to the demo evaluation set, which is written for the
# demo corpus (and its folder is relative to the repository, not to OUT).
p["train"].update(batch_size=int(batch), max_steps=int(steps), eval_every=50, save_every=50,
                  eval_max_pairs=500, eval_fallback=[])
p["evaluate"].update(max_pairs=None, baseline_poolings=["auto", "cls_before_pooler", "mask"],
                     tasks=["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"],
                     sts_missing="error")
if positives == "apertium":
    standin = copy.deepcopy(p)
    standin["backtranslate"] = profile_params("demo")["backtranslate"]
    standin["backtranslate"].update(output="data/candidates-standin",
                                    metrics="metrics/backtranslate-standin.json",
                                    plot="plots/backtranslate-standin_edit_ratio.png")
    yaml.safe_dump(standin, open(out.replace("params.yaml", "params-standin.yaml"), "w"),
                   sort_keys=False)
    p["report"]["compare_candidates"] = ["data/candidates-standin"]
yaml.safe_dump(p, open(out, "w"), sort_keys=False)
PY

cd "$OUT"
for stage in $STAGES; do
  if [[ "$stage" == report && -f params-standin.yaml ]]; then
    echo "== backtranslate (stand-ins, for the report's comparison)"
    /usr/bin/time -f "backtranslate stand-ins: %e s, peak %M KB" \
      pairforge backtranslate --params params-standin.yaml
  fi
  echo "== $stage"; /usr/bin/time -f "$stage: %e s, peak %M KB" pairforge "$stage" --params params.yaml
done
for objective in $OBJECTIVES; do
  echo "== train $objective"
  /usr/bin/time -f "train $objective: %e s, peak %M KB" pairforge train -o "$objective" --params params.yaml
done
echo "== evaluate"; /usr/bin/time -f "evaluate: %e s" pairforge evaluate --params params.yaml
cat reports/evaluate.md
