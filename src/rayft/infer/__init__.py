"""Using a trained model: the model directory of a run or an export (:mod:`.model_dir`), batch
generation (:mod:`.generate`) and the terminal chat (:mod:`.chat`)."""
