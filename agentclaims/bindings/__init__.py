"""In-process bindings of agentclaims to third-party agent libraries, all optional.

* :mod:`agentclaims.bindings.langgraph`: the Agent Execution Graph of a compiled LangGraph
  graph (``aeg_from_langgraph``) and the node path of a run (``task_path``);
* :mod:`agentclaims.bindings.decorators`: ``@claimed_session`` and ``ClaimedGraph``, which run
  an async function or a compiled LangGraph graph in its own ``ClaimedSession``;
* :mod:`agentclaims.bindings.openai`: an ``openai.AsyncOpenAI`` client bound to a backend through
  the claims transport (``openai_client``);
* :mod:`agentclaims.bindings.langchain`: LangChain's ``ChatOpenAI`` bound likewise
  (``chat_model``).

Each binding imports its third-party library only when it is loaded; this package imports none
of them. Bindings that run in another system's environment (e.g. inside a serving engine) are
separate distributions under the repository's ``integrations/`` folder.
"""
