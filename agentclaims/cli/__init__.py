"""The ``agentclaims`` command line."""
