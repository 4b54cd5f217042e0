"""Every JSON schema a role sends to a server, built with representative arguments (snapshot and test share this)."""
from reveal_kit.core import Config


def _pool():
    from reveal_kit.reveal.rubrics import load_rubric_pool
    return load_rubric_pool()


def _factors():
    from reveal_kit.pace.factors import Factor
    return [Factor('f1', 'the red car'), Factor('f2', 'parks', 'action'), Factor('f3', 'after lunch', 'temporal')]


def cases() -> dict:
    "name → a function that returns the schema dict the role sends."
    from reveal_kit.reveal import planner, verifier, relevance, answerer, rerank, pairs, proposers
    from reveal_kit.pace import factors, captions, inspect, tools, prompts, needle
    from reveal_kit.eval import baselines
    pool, L4, L5 = _pool(), list('ABCD'), list('ABCDE')
    cfg = Config()
    names = pool.names[:3]
    return {
        'planner.decompose_4': lambda: planner.decompose_schema(4, cfg),
        'planner.decompose_6': lambda: planner.decompose_schema(6, cfg),
        'planner.repair': lambda: planner.repair_schema(cfg),
        'verifier.select': lambda: verifier.select_schema(pool),
        'verifier.score': lambda: verifier.score_schema(L4, names),
        'verifier.score_5x1': lambda: verifier.score_schema(L5, names[:1]),
        'relevance': lambda: relevance.relevance_schema(),
        'answerer.answer_4': lambda: answerer.answer_schema(L4),
        'answerer.answer_5': lambda: answerer.answer_schema(L5),
        'rerank_1': lambda: rerank.rerank_schema(1),
        'rerank_5': lambda: rerank.rerank_schema(5),
        'pairs.teacher_0': lambda: pairs.teacher_schema(0),
        'pairs.teacher_7': lambda: pairs.teacher_schema(7),
        'pairs.teacher_30': lambda: pairs.teacher_schema(30),
        'proposers.proposer': lambda: proposers.proposer_schema(),
        'baselines.answer': lambda: baselines.ANSWER_SCHEMA,
        'needle.judge': lambda: needle.JUDGE_SCHEMA,
        'captions.caption': lambda: captions.caption_schema(),
        'captions.caption_800': lambda: captions.caption_schema(800),
        'captions.registry': lambda: captions.registry_schema(),
        'captions.factor_record': lambda: captions.factor_record_schema(_factors()),
        'captions.factor_record_1_900': lambda: captions.factor_record_schema(_factors()[:1], 900),
        'inspect': lambda: inspect.inspect_schema(),
        'inspect_500': lambda: inspect.inspect_schema(500),
        'factors_1_3': lambda: factors.factor_schema(1, 3),
        'factors_2_2': lambda: factors.factor_schema(2, 2),
        'tools.pace': lambda: tools.tool_schemas(),
        'tools.pace_letters': lambda: tools.tool_schemas(tools.PACE_TOOLS, L4),
        'tools.dvd_letters': lambda: tools.tool_schemas(tools.DVD_TOOLS, L5),
        'tools.finish': lambda: tools.tool_schemas(['Finish']),
        'tools.contrastive_4': lambda: tools.contrastive_schema(L4),
        'tools.contrastive_2': lambda: tools.contrastive_schema(list('AB')),
        'tools.browse': lambda: tools.BROWSE_SCHEMA,
        'agent.call_all': lambda: prompts.call_schema(tools.PACE_TOOLS, L4),
        'agent.call_finish': lambda: prompts.call_schema(['Finish'], L5),
        'agent.call_noletters': lambda: prompts.call_schema(tools.DVD_TOOLS),
    }
