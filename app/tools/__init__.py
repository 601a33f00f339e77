"""The tool loop's app side: tools from MCP servers and built in, the user's consent, and the runner.

- :mod:`.config`: ``tools.json``, the one home of the tools configuration (servers, tools, consent policies).
- :mod:`.builtin`: the tools that need no server (the date and time; a timer that chimes).
- :mod:`.mcp_servers`: MCP servers through the official SDK, started on demand, stopped on quit.
- :mod:`.runner`: from the model's calls to the results it hears: checked, consented, run, bounded.

The engine's side (the tool prompt, injecting the results) is ``engine.tools``, reached through the facade.
"""
