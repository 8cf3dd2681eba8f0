"""A custom Aggregator for the tests (Data-Juicer's own aggregators all call a model API): each
grouped row's size and its longest text, into its batch meta."""

from data_juicer.ops.base_op import OPERATORS, Aggregator
from data_juicer.utils.constant import Fields


@OPERATORS.register_module("group_summary_aggregator")
class GroupSummaryAggregator(Aggregator):
    """Each grouped row's size and longest text, into its batch meta."""

    def process_single(self, sample):
        texts = sample[self.text_key]
        sample[Fields.batch_meta]["count"] = len(texts)
        sample[Fields.batch_meta]["longest"] = max(texts, key=len)
        return sample
