"""Terminal output: the progress bar of a run (`progress`) and listings (`tables`).

Knows no run: each run's summary prints itself with these, from the module that owns the run.
"""
