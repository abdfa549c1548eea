# Two Cloud SQL for PostgreSQL instances: "pay" holds paydb and raildb,
# "lock" holds lockdb alone and is REGIONAL (a standby in a second zone),
# so that killing the lock primary (SC-08) fails lockdb over and leaves
# the pay instance untouched. Users are IAM service accounts
# (cloudsql.iam_authentication): no password exists in a variable, in
# state or in an output.

variable "project_id" {
  type = string
}

variable "region" {
  type = string
}

variable "name_prefix" {
  type = string
}

variable "tier" {
  type = string
}

variable "labels" {
  type = map(string)
}

variable "pay_users" {
  description = "IAM database users of the pay instance (payment-resource, rail-proxy), by a static key."
  type        = map(string)
}

variable "lock_users" {
  description = "IAM database users of the lock instance (lock-server), by a static key."
  type        = map(string)
}

# A deleted instance's name cannot be reused for about a week: a suffix
# new to each environment lets a game day follow a destroy.
resource "random_id" "suffix" {
  byte_length = 3
}

resource "google_sql_database_instance" "pay" {
  project             = var.project_id
  name                = "${var.name_prefix}-pay-${random_id.suffix.hex}"
  region              = var.region
  database_version    = "POSTGRES_16"
  deletion_protection = false

  settings {
    # PostgreSQL 16 defaults to Enterprise Plus, which refuses small tiers.
    edition                     = "ENTERPRISE"
    tier                        = var.tier
    availability_type           = "ZONAL"
    deletion_protection_enabled = false
    user_labels                 = var.labels

    database_flags {
      name  = "cloudsql.iam_authentication"
      value = "on"
    }

    # What an incident needs in the server's log (Cloud Logging): who
    # connected and left, lock waits, checkpoints and every temporary file.
    # The services keep pools, so connection lines are few.
    database_flags {
      name  = "log_checkpoints"
      value = "on"
    }
    database_flags {
      name  = "log_connections"
      value = "on"
    }
    database_flags {
      name  = "log_disconnections"
      value = "on"
    }
    database_flags {
      name  = "log_lock_waits"
      value = "on"
    }
    database_flags {
      name  = "log_temp_files"
      value = "0"
    }

    # Public IP without authorized networks: only the Cloud SQL connector
    # and Auth Proxy (mTLS, IAM-authorised) can connect. A private IP needs
    # Private Service Access, a peering that outlives the instances for
    # days after they are deleted and stops destroy at the network.
    # ssl_mode ENCRYPTED_ONLY refuses every unencrypted connection; tfsec
    # v1.26 reads only require_ssl, which ssl_mode replaces.
    # tfsec:ignore:google-sql-encrypt-in-transit-data
    ip_configuration {
      # tfsec:ignore:google-sql-no-public-access
      ipv4_enabled = true
      ssl_mode     = "ENCRYPTED_ONLY"
    }

    backup_configuration {
      enabled                        = true
      point_in_time_recovery_enabled = true
    }
  }
}

resource "google_sql_database_instance" "lock" {
  project             = var.project_id
  name                = "${var.name_prefix}-lock-${random_id.suffix.hex}"
  region              = var.region
  database_version    = "POSTGRES_16"
  deletion_protection = false

  settings {
    edition                     = "ENTERPRISE"
    tier                        = var.tier
    availability_type           = "REGIONAL"
    deletion_protection_enabled = false
    user_labels                 = var.labels

    database_flags {
      name  = "cloudsql.iam_authentication"
      value = "on"
    }

    # What an incident needs in the server's log (Cloud Logging): who
    # connected and left, lock waits, checkpoints and every temporary file.
    # The services keep pools, so connection lines are few.
    database_flags {
      name  = "log_checkpoints"
      value = "on"
    }
    database_flags {
      name  = "log_connections"
      value = "on"
    }
    database_flags {
      name  = "log_disconnections"
      value = "on"
    }
    database_flags {
      name  = "log_lock_waits"
      value = "on"
    }
    database_flags {
      name  = "log_temp_files"
      value = "0"
    }

    # As on the pay instance: public IP reached only through the Auth
    # Proxy; TLS required by ssl_mode.
    # tfsec:ignore:google-sql-encrypt-in-transit-data
    ip_configuration {
      # tfsec:ignore:google-sql-no-public-access
      ipv4_enabled = true
      ssl_mode     = "ENCRYPTED_ONLY"
    }

    # High availability on PostgreSQL needs backups and point-in-time
    # recovery.
    backup_configuration {
      enabled                        = true
      point_in_time_recovery_enabled = true
    }
  }
}

resource "google_sql_database" "paydb" {
  project  = var.project_id
  name     = "paydb"
  instance = google_sql_database_instance.pay.name
  # Dropping a PostgreSQL database that IAM users own objects in fails;
  # deleting the instance removes it anyway.
  deletion_policy = "ABANDON"
}

resource "google_sql_database" "raildb" {
  project  = var.project_id
  name     = "raildb"
  instance = google_sql_database_instance.pay.name
  # Dropping a PostgreSQL database that IAM users own objects in fails;
  # deleting the instance removes it anyway.
  deletion_policy = "ABANDON"
}

resource "google_sql_database" "lockdb" {
  project  = var.project_id
  name     = "lockdb"
  instance = google_sql_database_instance.lock.name
  # Dropping a PostgreSQL database that IAM users own objects in fails;
  # deleting the instance removes it anyway.
  deletion_policy = "ABANDON"
}

resource "google_sql_user" "pay" {
  for_each = var.pay_users
  project  = var.project_id
  instance = google_sql_database_instance.pay.name
  name     = each.value
  type     = "CLOUD_IAM_SERVICE_ACCOUNT"
  # A PostgreSQL role that owns tables cannot be dropped through the API;
  # deleting the instance removes it anyway.
  deletion_policy = "ABANDON"
}

resource "google_sql_user" "lock" {
  for_each = var.lock_users
  project  = var.project_id
  instance = google_sql_database_instance.lock.name
  name     = each.value
  type     = "CLOUD_IAM_SERVICE_ACCOUNT"
  # A PostgreSQL role that owns tables cannot be dropped through the API;
  # deleting the instance removes it anyway.
  deletion_policy = "ABANDON"
}

output "pay_connection_name" {
  value = google_sql_database_instance.pay.connection_name
}

output "lock_connection_name" {
  value = google_sql_database_instance.lock.connection_name
}
