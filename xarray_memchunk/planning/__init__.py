"""Planning: pure functions from dims, roles, a memory model and a budget to a ChunkPlan."""
