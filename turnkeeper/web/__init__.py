"""`turnkeeper web`: the HTTP API and the chat page, next to the workers.

It talks to Temporal and the session store only; run as many as you like.
Nothing here is imported by the CLI's other commands.
"""
