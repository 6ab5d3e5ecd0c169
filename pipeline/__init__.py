"""The pipeline: state file -> desired resources -> observed -> drift -> plan -> results -> report.

contract.py, values.py, paths.py and atomic.py are the floor every layer stands on (they import
nothing of ours); statefile/, engine.py, journal.py, plans.py, report.py and watch.py run a pass.
"""
