"""Standard-library helpers every layer may use: atomic file writing (`atomic`), reading a file someone else
wrote (`files`), CSV cells and console names made safe (`untrusted_text`), the test-only crash hooks (`faults`),
FLOP counting and matmul timing (`perf`), interleaved timing (`timing`). Import them by module:
`from vit.utils.atomic import ...`; this `__init__` imports nothing, so `vit.utils.atomic` stays free of torch."""
