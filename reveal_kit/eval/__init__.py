"""Evaluation: benchmark loaders, baselines, the method registry, the runner, metrics, figures and trace views."""
