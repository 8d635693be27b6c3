"""The commands that estimate and measure one workload, each measurement in a fresh process."""
