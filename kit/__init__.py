"""The kit's generated script, kept out of the package it is generated from.

kit/mesure_memoire.py is written by `python -m pipeline.kit.make_kit_script` from
pipeline/workloads/seed_network.py and pipeline/core/; never edit it by hand (a test and
`make archive` refuse a script that is not regenerated). Nothing in the pipeline imports it:
the launcher runs it by name in its children, as `python -m kit.mesure_memoire`. This file
only makes `kit` a package of this repository; it is not shipped.
"""
