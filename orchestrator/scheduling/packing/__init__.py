"""Memory-aware packing (pure): its types, each card's view, holds and gangs."""
