// The owner of holdpoint_harness_pch, the precompiled header the torch-heavy
// examples, tests and benchmarks share (CMakeLists.txt). Nothing else.
