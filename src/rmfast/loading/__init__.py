"""Loading models: names and aliases, GGUF conversion, folders and hub ids, custom reward heads,
training checkpoints.
"""
