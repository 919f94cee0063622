"""Small verifiable tasks written for the repository (generated, seeded)."""
