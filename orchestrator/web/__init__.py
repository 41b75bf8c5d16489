"""The web page (`orch web`) and the self-contained report (`orch report`) over state.db.

Everything is read through `orchestrator.store.web_queries`; pages are HTML with inline SVG
drawn here on the server, so neither needs a network or a JavaScript chart library.
"""
