"""Answering (paper §3.3): a search result rendered as the prompt's memory block, one LLM
request per question, a short answer citing what it used."""
