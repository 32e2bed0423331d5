"""Tessera: block-granular LLM serving control plane (the pure core)."""
