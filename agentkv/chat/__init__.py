"""The conversation protocol: how a model family offers tools and writes its calls (`formats/`),
a call and its parts (`calls.py`), reasoning blocks (`reasoning.py`), OpenAI-shaped messages
rendered in a family's format (`messages.py`), and one reply's plan and read-back (`turn.py`).

It imports neither the engine nor torch: the engine, the server and the agent loop all take their
turns from here.
"""
