"""The AMQP 0-9-1 server that maps RabbitMQ clients onto the CMQ model."""
