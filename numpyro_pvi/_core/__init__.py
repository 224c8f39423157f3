"""The private core: the machinery the public objectives, diagnostics,
selection and guides are built on, behind this one door.

Code outside ``numpyro_pvi._core`` imports the core from here only
(``from numpyro_pvi._core import particle_terms``); the modules inside
import one another directly. Nothing here is public API: names move or
change without deprecation.

- :mod:`~numpyro_pvi._core.particles`: the particle machinery
  (:func:`particle_terms`), one trace of guide and model per particle,
  shared by training and diagnostics; :mod:`~numpyro_pvi._core.tracing` and
  :mod:`~numpyro_pvi._core.data_plate` beneath it.
- :mod:`~numpyro_pvi._core.draws`: compiled draws from a fitted guide
  (:func:`guide_draws`), the one way diagnostics draw.
- :mod:`~numpyro_pvi._core.held_out`, :mod:`~numpyro_pvi._core.psis`,
  :mod:`~numpyro_pvi._core.moment_matching`: held-out estimates, Pareto
  smoothing in JAX, moment matching of far observations.
- :mod:`~numpyro_pvi._core.structure`, :mod:`~numpyro_pvi._core.validation`:
  the model's structure, argument checks with their messages;
  :mod:`~numpyro_pvi._core.autoguide_setup`: an autoguide's prototype,
  built eagerly or inside a trace.
- :mod:`~numpyro_pvi._core.recipes`, :mod:`~numpyro_pvi._core.deprecation`:
  the option values of the procedures that fit, and the one shim that
  translates the call shapes of earlier versions.
- :mod:`~numpyro_pvi._core.numpyro_private`: NumPyro's private names.
"""

from numpyro_pvi._core import deprecation, pmf
from numpyro_pvi._core.autoguide_setup import (
    needs_prototype,
    set_up_autoguide,
    traceable_guide,
)
from numpyro_pvi._core.binomial_pairs import (
    POLYNOMIAL_SUPPORT,
    binomial_next_overlaps,
    binomial_strata_overlaps,
)
from numpyro_pvi._core.contrastive import fixed_draw_terms
from numpyro_pvi._core.data_plate import (
    DataPlate,
    check_same_plate,
    data_sites,
    find_data_plate,
    joint_log_likelihood,
    per_observation,
    plate_of,
)
from numpyro_pvi._core.draws import (
    CONCRETE_VALUE_ERRORS,
    cached_program_count,
    check_fitted_call,
    guide_draws,
    join_arrays,
    split_arrays,
    structured_draws,
)
from numpyro_pvi._core.fast_draws import fast_draw, has_fast_draw
from numpyro_pvi._core.folds import fold_ids
from numpyro_pvi._core.gamma_draws import standard_gamma
from numpyro_pvi._core.held_out import (
    MIN_NEAR,
    Pointwise,
    estimate_with_total,
    log_contributions,
    log_sum_estimate,
    log_sum_parts,
    mixture_terms,
    near_draws,
    observation_subset,
    pair_gain,
    pointwise_estimate,
    unsettled,
)
from numpyro_pvi._core.imputed import imputed_entries
from numpyro_pvi._core.loo import (
    approximate_loo_log_weights,
    approximate_loo_pointwise,
)
from numpyro_pvi._core.moment_matching import moment_matcher

# first: the scores (imported by held_out below) import it through this door
from numpyro_pvi._core.normal import normal_abs_mean, normal_strata_crps  # noqa: I001
from numpyro_pvi._core.numpyro_private import (
    resolve_observed_sites,
    unpack_latent,
    validate_latent_sites,
)
from numpyro_pvi._core.observed import observed_sites, simulation_law
from numpyro_pvi._core.particles import (
    ParticleSpec,
    particle_terms,
    split_particle_key,
)
from numpyro_pvi._core.pmf import (
    CDF_SUMS_SUPPORT,
    UNROLLED_SUPPORT,
    binomial_cdf_sums,
    binomial_support_sums,
    support_log_pmf,
    support_pmf,
)
from numpyro_pvi._core.psis import MIN_TAIL, good_k, psis_smooth, tail_length
from numpyro_pvi._core.recipes import (
    CHAIN_METHODS,
    FitRecipe,
    Replications,
    check_recipe,
)
from numpyro_pvi._core.rejection import (
    RejectionStats,
    check_no_model_params,
    rejection_estimate,
    rejection_options,
    rejection_score_function,
)
from numpyro_pvi._core.site_laws import (
    QUADRATIC_MAX_VALUES,
    censoring_refusal,
    describe,
    is_censored,
    no_sampler,
    sampler_failure,
)
from numpyro_pvi._core.site_values import (
    observation_layout,
    single_observation,
    site_names,
)
from numpyro_pvi._core.structure import (
    amortized_latents,
    check_full_data,
    feasible_improper,
    improper_latents,
    latent_dependent_observations,
    model_structure,
    replay_trace,
    single_draw_outcome,
)
from numpyro_pvi._core.student_draws import standard_t
from numpyro_pvi._core.svi_scan import svi_scan
from numpyro_pvi._core.tracing import (
    drawn_params,
    guide_latent_log_density,
    guide_log_density,
    guide_sample_values,
    is_sample_draw,
    latent_sites,
    obs_mask_site,
    seed_plates,
    sum_log_density,
)
from numpyro_pvi._core.validation import (
    check_bool,
    check_data_plate,
    check_int,
    check_loss_target,
    check_real,
    check_real_or_array,
    warn_laplace_held_out,
    warn_point_mass,
)

__all__ = [
    "QUADRATIC_MAX_VALUES",
    "drawn_params",
    "amortized_latents",
    "normal_abs_mean",
    "observation_layout",
    "single_observation",
    "site_names",
    "normal_strata_crps",
    "approximate_loo_log_weights",
    "MIN_TAIL",
    "approximate_loo_pointwise",
    "fold_ids",
    "fast_draw",
    "has_fast_draw",
    "standard_gamma",
    "standard_t",
    "joint_log_likelihood",
    "CHAIN_METHODS",
    "FitRecipe",
    "Replications",
    "check_recipe",
    "deprecation",
    "CONCRETE_VALUE_ERRORS",
    "DataPlate",
    "ParticleSpec",
    "Pointwise",
    "MIN_NEAR",
    "log_contributions",
    "near_draws",
    "unsettled",
    "RejectionStats",
    "cached_program_count",
    "censoring_refusal",
    "check_bool",
    "check_data_plate",
    "check_no_model_params",
    "check_same_plate",
    "check_fitted_call",
    "check_full_data",
    "check_int",
    "check_loss_target",
    "check_real",
    "check_real_or_array",
    "data_sites",
    "describe",
    "feasible_improper",
    "find_data_plate",
    "fixed_draw_terms",
    "guide_draws",
    "guide_latent_log_density",
    "guide_log_density",
    "is_sample_draw",
    "guide_sample_values",
    "improper_latents",
    "is_censored",
    "sampler_failure",
    "no_sampler",
    "join_arrays",
    "imputed_entries",
    "latent_dependent_observations",
    "latent_sites",
    "log_sum_estimate",
    "log_sum_parts",
    "mixture_terms",
    "model_structure",
    "moment_matcher",
    "needs_prototype",
    "obs_mask_site",
    "observed_sites",
    "simulation_law",
    "particle_terms",
    "per_observation",
    "plate_of",
    "pmf",
    "observation_subset",
    "pair_gain",
    "estimate_with_total",
    "pointwise_estimate",
    "psis_smooth",
    "tail_length",
    "good_k",
    "rejection_options",
    "rejection_estimate",
    "rejection_score_function",
    "split_particle_key",
    "replay_trace",
    "resolve_observed_sites",
    "seed_plates",
    "set_up_autoguide",
    "single_draw_outcome",
    "split_arrays",
    "structured_draws",
    "sum_log_density",
    "support_log_pmf",
    "support_pmf",
    "binomial_cdf_sums",
    "binomial_support_sums",
    "POLYNOMIAL_SUPPORT",
    "binomial_strata_overlaps",
    "binomial_next_overlaps",
    "CDF_SUMS_SUPPORT",
    "UNROLLED_SUPPORT",
    "svi_scan",
    "traceable_guide",
    "unpack_latent",
    "validate_latent_sites",
    "warn_laplace_held_out",
    "warn_point_mass",
]
