"""`pytest benchmarks --benchmark-only`: the bench_*.py cases as pytest-benchmark tests (small shapes, CPU),
for regression tracking between commits. The README's test command (`pytest`) does not collect these."""
