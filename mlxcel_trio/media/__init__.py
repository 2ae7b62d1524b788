"""Media handling shared by the surfaces: decoding with bounds (pure, no MLX, no trio)."""
