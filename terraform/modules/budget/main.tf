# The billing budget: created before anything that costs money. Every
# other module of the root depends on this one, so no plan can create a
# billable resource without it.

variable "project_id" {
  type = string
}

variable "project_number" {
  type = string
}

variable "billing_account" {
  type = string
}

variable "amount" {
  description = "Monthly amount in whole units of the billing account's currency (the currency is left to the account: a mismatching currency_code is refused)."
  type        = number
}

variable "display_name" {
  type = string
}

# The Billing Budget API must be on in the quota project before the budget
# can be created with user credentials.
resource "google_project_service" "billingbudgets" {
  project            = var.project_id
  service            = "billingbudgets.googleapis.com"
  disable_on_destroy = false
}

resource "google_billing_budget" "lab" {
  billing_account = var.billing_account
  display_name    = var.display_name

  budget_filter {
    projects = ["projects/${var.project_number}"]
  }

  amount {
    specified_amount {
      units = tostring(var.amount)
    }
  }

  threshold_rules {
    threshold_percent = 0.5
  }
  threshold_rules {
    threshold_percent = 0.9
  }
  threshold_rules {
    threshold_percent = 1.0
  }
  threshold_rules {
    threshold_percent = 1.0
    spend_basis       = "FORECASTED_SPEND"
  }

  depends_on = [google_project_service.billingbudgets]
}

output "budget_id" {
  value = google_billing_budget.lab.id
}
