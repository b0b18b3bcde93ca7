"""The bench items, one module per figure it measures (python -m bench runs them; bench/README.md
names each item's number and method)."""
