"""Model building blocks that compute only through hetero ops, resolved once at init."""
