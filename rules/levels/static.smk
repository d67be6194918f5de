# L1 (static, rule-based verifier) tasks: GSM8K, HumanEval. Their data preparation and
# evaluation run through the generic prepare_data / evaluate_* rules with the task's module;
# nothing level-specific is needed yet. L2 (judge) and L3 (environment) levels add their own
# rules here (judge caches, game generation, search indexes).
