"""standin: build the tiny stand-in translation models the offline demo back-translates with."""
