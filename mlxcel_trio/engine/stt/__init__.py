"""Speech to text on the MLX thread: a Whisper checkpoint served as -m
(whisper.py the model, mel.py its front end, transcriber.py the job queue)."""
