"""The checkpoint half of the device: undo logger, commit, MLP checkpoint copier and
recovery engine.

The contract every block here implements is ``docs/checkpoint.md``: superblock, commit
word, undo-log record and MLP-slot formats, the ordering rules and the recovery
algorithm. The golden persistence model written from that page is ``sim/ckpt.py``.
"""
