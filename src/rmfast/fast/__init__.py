"""The fast path: the shared-prompt engine, its one decoder layer, the kernel dispatch (ops),
the architectures it knows and the reward heads it reads.
"""
