"""The demo workload: a supervisor with tool-using `create_agent` workers, on the scripted model."""
