"""TrainingCXL device generator (Amaranth HDL).

``hw`` never imports ``tb`` or ``sim``: the generator stands on its own so that the
same layouts, opcodes and register description serve RTL, test benches and docs.
"""
