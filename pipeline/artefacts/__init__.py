"""Every artefact's schema and facts, checked in one place (validate.py)."""
