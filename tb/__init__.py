"""cocotb side: bus functional models, the PMEM model, the GPU/host agent and one
cocotb test module per block. Imports ``hw`` for layouts, opcodes and registers."""
