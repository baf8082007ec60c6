"""What a model costs where it is served: hardware, serving engines, weight/KV formats, workloads,
targets (hardware x workload x constraints), the analytic cost model, its profiles, fitting,
validation against published measurements, and calibration on this machine's own timings.

Imports :mod:`autocompress_opt.arch` and (for the timed CPU model) :mod:`autocompress_opt.hf`.
"""
