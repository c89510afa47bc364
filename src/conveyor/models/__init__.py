"""Model backends behind one protocol per model family."""
