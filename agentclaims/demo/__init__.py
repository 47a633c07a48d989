"""The demo workload: a supervisor with tool-using ReAct workers, on the scripted model."""
