"""IteraGPU Lab's pipeline, one folder per floor; a module imports only from its own floor and
the floors below it (tests/test_imports.py), so a `measure` call walks down and never back up.

From the bottom: core (allocator model, phase protocol, environment, writers, the workload
contract and registry), predicting (the trace and the H200's calibration), workloads (what
each kind of workload is and what its files must say), artefacts (schemas and facts of every
file), kit (generating, archiving and verifying the kit), measuring (the commands that
estimate and measure a workload, in fresh processes), stages (the chain, sweeps, logs, fit
and report). The kit's two scripts import nothing of the pipeline: kit/mesure_memoire.py is
generated from core and workloads/seed_network.py and kept outside this package;
calcul_forfaits.py, beside the floors, is the one source of the prices fit and report
quote. Each command runs as `python -m pipeline.FLOOR.MODULE` from the repository root.
"""

FLOORS = ("core", "predicting", "workloads", "artefacts", "kit", "measuring", "stages")
