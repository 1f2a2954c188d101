"""Scoring jobs' common ground: the scoring plan, memory-bounded batch sizes, the batching loop,
the scan pipeline (token ids and texts), the plain Hugging Face path, candidates, results.
"""
