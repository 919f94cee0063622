"""Where the endpoint's model runs: in the replica on the engine, or in a Triton server."""
