"""REVEAL: online memory, rubric pools, planner, verifier, answerer, the agent loop and rubric induction."""
