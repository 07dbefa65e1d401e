"""The TFLM child processes: `child` starts and feeds them (TFLM may abort a
process), `worker` runs a model, `generation` decodes, `teacher` reads logits
teacher-forced. Light: a child imports no package `__init__` it can avoid."""
