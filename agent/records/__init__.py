"""What a session leaves and reads back: the JSONL trace (trace), the notebook made from it
(notebook), and the replay of its recorded cells in a fresh sandbox (replay)."""
