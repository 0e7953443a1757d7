"""MQTT 3.1.1 and 5.0 on the CMQ topics of ``amq.topic`` (SPEC MQ1-MQ7).

``codec`` (packets), ``connection`` (the sans-IO core), ``topics`` (MQ2 mapping),
``session`` (the client on the broker), ``retained`` (MQ5), ``transport`` and ``server``
(asyncio).
"""
