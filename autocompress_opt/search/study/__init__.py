"""The outer study: a persistent Optuna study whose global choices Ray Tune trials evaluate
(configuration, storage, coordination of several drivers, trial records and Pareto fronts, seeded
baselines and the proxy, schedulers, progress, plots). Each weights trial calls the inner search
(:mod:`autocompress_opt.search.inner`); nothing here is imported by it."""
