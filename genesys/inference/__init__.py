"""Pipeline-parallel inference: plan it (`plan`: roofline and schedules in closed form), check the
schedules event by event (`simulate`), and run a transformers model split layer-wise across processes
or machines (`transport`: the ring's hops with injected latency; `stage`: one stage's layers and cache;
`backend`: the `pipeline` generation backend, whose first stage is the process that runs it).
"""
