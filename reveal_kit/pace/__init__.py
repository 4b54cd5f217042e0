"""PACE: question-only factors, the factor-conditioned index, the tools and the option-aware agent."""
