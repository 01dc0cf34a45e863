"""The embedding engine: descriptor fetch and validation, gather-reduce (LOOKUP) and
scatter (UPDATE) over tables in device memory.

The contract every block here implements is ``docs/embedding.md``: descriptor layout,
status codes and their check order, EmbeddingBag semantics and the fixed accumulation
order. The golden models written from that page are in ``sim/embedding.py``.
"""
