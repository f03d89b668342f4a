"""pretrain: the sentences -> InfoCSE's pre-trained auxiliary MLM network (``models/infocse-aux``)."""
