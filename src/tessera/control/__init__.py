"""The control loops (issue 30): each observes, decides purely (`tessera.policies`),
actuates through the agents' RPCs and reports what it did; the operator and `tessera up`
only schedule their ticks and write what they report (docs/operator.md, "Loops")."""
