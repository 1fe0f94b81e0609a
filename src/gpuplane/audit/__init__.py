"""The GPU audit: usage samples → findings → recommended slices → a re-pack plan."""
