"""The ``walsvc`` data source: what ``spark.dataSource.register`` takes."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ._options import parse_source_options, parse_write_options
from ._rows import SCHEMA

__all__ = ("WalDataSource",)


class WalDataSource(DataSource):
    """``format("walsvc")``: batch and streaming reads of WAL pchannels (one row per data
    message, see ``walsvc.spark.SCHEMA``), and batch and streaming writes of rows into a
    WAL through its interceptor chain."""

    @classmethod
    def name(cls) -> str:
        return "walsvc"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        from ._batch import WalBatchReader

        return WalBatchReader(parse_source_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ._stream import WalStreamReader

        return WalStreamReader(parse_source_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ._writer import WalBatchWriter

        return WalBatchWriter(parse_write_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from ._writer import WalStreamWriter

        return WalStreamWriter(parse_write_options(self.options), schema, overwrite)
