"""Eager PyTorch implementations: the executable spec of every op, the "reference" backend and the
test oracle (run in float64). They compute in the dtype they are given, as an eager trainer would."""
