"""What the experiment notebooks call: shared runs, tables with intervals, and plots, per paper."""
